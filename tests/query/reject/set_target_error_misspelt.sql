-- a misspelt option
-- expect: did you mean dpsql.target_error
SET dpsql.target_errors = 10
