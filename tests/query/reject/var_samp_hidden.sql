-- a variance over a hidden column
-- expect: fnlwgt
SELECT VAR_SAMP(fnlwgt) FROM adult
