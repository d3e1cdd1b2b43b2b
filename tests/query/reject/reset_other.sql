-- reset a database setting
-- expect: not allowed
RESET threads
