-- a dpsql option that does not exist
-- expect: unknown option
SET dpsql.noise = off
