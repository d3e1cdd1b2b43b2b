-- call a table function
-- expect: CALL
CALL pragma_version()
