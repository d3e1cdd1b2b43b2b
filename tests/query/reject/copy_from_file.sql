-- load attacker data into the store
-- expect: COPY
COPY adult FROM '/tmp/evil.csv'
