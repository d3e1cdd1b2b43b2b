-- erase the ledger
-- expect: DELETE
DELETE FROM dpsql.charges
