-- define a function
-- expect: CREATE
CREATE MACRO leak(x) AS x
