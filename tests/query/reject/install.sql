-- install an extension
-- expect: INSTALL
INSTALL httpfs
