-- change a global setting
-- expect: SET GLOBAL
SET GLOBAL dpsql.epsilon = 1
