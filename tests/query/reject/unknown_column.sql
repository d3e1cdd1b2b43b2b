-- a misspelt column
-- expect: did you mean 'age'
SELECT COUNT(*) FROM adult WHERE agee > 30
