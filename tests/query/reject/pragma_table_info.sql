-- read the schema through PRAGMA
-- expect: PRAGMA
PRAGMA table_info('adult')
