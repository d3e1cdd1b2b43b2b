-- a sum of a public column weighs each private row by a value with no declared bounds
-- expect: aggregating public column edu.years
SELECT SUM(e.years) FROM adult a JOIN edu e ON a.education_num = e.education_num
