-- MAX with a second argument (DuckDB's top-n MAX)
-- expect: takes one column
SELECT MAX(age, 3) FROM adult
