-- read the catalog
-- expect: unknown table
SELECT COUNT(*) FROM information_schema.tables
