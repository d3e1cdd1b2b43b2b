-- read the environment
-- expect: getenv
SELECT COUNT(*) FROM adult WHERE getenv('HOME') = '/root'
