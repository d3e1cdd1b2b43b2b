-- sampling
-- expect: SAMPLE
SELECT COUNT(*) FROM adult USING SAMPLE 10%
