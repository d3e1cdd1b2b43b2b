-- an inequality join matches a row to several public rows
-- expect: join condition compares a dataset column with the public table's key
SELECT COUNT(*) FROM adult a JOIN edu e ON a.education_num < e.education_num
