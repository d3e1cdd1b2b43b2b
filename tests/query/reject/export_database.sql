-- export everything
-- expect: EXPORT
EXPORT DATABASE '/tmp/dump'
