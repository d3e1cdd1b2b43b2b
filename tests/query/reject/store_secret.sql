-- read the store secret
-- expect: unknown table
SELECT COUNT(*) FROM dpsql.meta WHERE key = 'secret'
