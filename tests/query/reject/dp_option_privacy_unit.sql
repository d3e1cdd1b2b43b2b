-- override the policy's privacy unit
-- expect: option privacy_unit_column
SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (privacy_unit_column = fnlwgt) COUNT(*) FROM adult
