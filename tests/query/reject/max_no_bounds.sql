-- MAX of a text column
-- expect: no bounds
SELECT MAX(puma) FROM acs WHERE sex = 1
