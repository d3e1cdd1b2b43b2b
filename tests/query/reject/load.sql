-- load an extension
-- expect: LOAD
LOAD httpfs
