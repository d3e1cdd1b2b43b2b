-- a misspelt dataset
-- expect: did you mean 'adult'
SELECT COUNT(*) FROM adults
