-- detach the store
-- expect: DETACH
DETACH DATABASE adult
