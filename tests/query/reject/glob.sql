-- list files
-- expect: glob
SELECT COUNT(*) FROM glob('/*')
