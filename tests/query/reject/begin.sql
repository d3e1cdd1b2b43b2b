-- open a transaction
-- expect: BEGIN
BEGIN TRANSACTION
