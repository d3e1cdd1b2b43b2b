-- joining two private datasets mixes two privacy units and fans rows out
-- expect: joining two datasets
SELECT COUNT(*) FROM adult a JOIN acs b ON a.age = b.agep
