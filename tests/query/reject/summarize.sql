-- SUMMARIZE computes exact statistics
-- expect: SUMMARIZE
SUMMARIZE adult
