-- a key set too large to answer
-- expect: public groups
SELECT COUNT(*) FROM adult GROUP BY dp_bin(age, 1), dp_bin(capital_gain, 1), dp_bin(capital_loss, 1), dp_bin(hours_per_week, 1)
