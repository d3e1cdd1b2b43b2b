-- one public table per query
-- expect: may join one public table
SELECT COUNT(*) FROM adult a JOIN edu e ON a.education_num = e.education_num JOIN edu f ON a.age = f.education_num
