-- a text column compared with a number would need a cast that can fail on a row
-- expect: cannot be compared
SELECT COUNT(*) FROM acs JOIN edu ON acs.puma = edu.education_num
