-- destroy data
-- expect: DROP
DROP TABLE adult
