-- concatenate raw values
-- expect: has no differentially private mechanism
SELECT string_agg(CAST(age AS VARCHAR), ',') FROM adult
