-- plan serialization optimises SQL text and reveals exact statistics of its tables
-- expect: json_serialize_plan
SELECT json_serialize_plan('SELECT min(age), max(age), count(*) FROM adult')
