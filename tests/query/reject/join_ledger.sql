-- join the ledger
-- expect: JOIN
SELECT COUNT(*) FROM adult JOIN dpsql.meta ON true
