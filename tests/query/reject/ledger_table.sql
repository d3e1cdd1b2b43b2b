-- read the ledger
-- expect: unknown table
SELECT COUNT(*) FROM dpsql.charges
