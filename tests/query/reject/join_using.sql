-- USING is refused: the condition must name the public key
-- expect: JOIN
SELECT COUNT(*) FROM adult JOIN edu USING (education_num)
