-- join the ledger
-- expect: JOIN
-- at: 4:33
SELECT COUNT(*) FROM adult JOIN dpsql.meta ON true
