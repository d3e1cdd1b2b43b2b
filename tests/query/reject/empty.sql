-- an empty statement
-- expect: empty statement
;
