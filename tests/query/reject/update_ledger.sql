-- refund one's own budget
-- expect: UPDATE
UPDATE dpsql.charges SET units = 0
