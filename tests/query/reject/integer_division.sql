-- integer division by zero raises on data
-- expect: INTDIV
SELECT COUNT(*) FROM adult WHERE age // 0 = 1
