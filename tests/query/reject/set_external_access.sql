-- turn file access back on
-- expect: SET enable_external_access
SET enable_external_access = true
