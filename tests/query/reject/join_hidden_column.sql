-- joining on a hidden column would reveal it through the public table's columns
-- expect: hidden
SELECT e.level, COUNT(*) FROM adult a JOIN edu e ON a.fnlwgt = e.education_num GROUP BY e.level
