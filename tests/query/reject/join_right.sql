-- a right join keeps public rows with no private row (and a full join both)
-- expect: RIGHT JOIN is not allowed
SELECT COUNT(*) FROM adult a RIGHT JOIN edu e ON a.education_num = e.education_num
