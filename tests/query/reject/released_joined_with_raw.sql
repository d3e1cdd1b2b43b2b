-- join a released table with a sensitive one
-- expect: not a released table
SELECT COUNT(*) FROM released.anything JOIN adult ON true
