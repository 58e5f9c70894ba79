-- crawlq schema 6: the limit rules with a wildcard, indexed apart. A crawl adds a rule for each
-- host whose robots.txt has a Crawl-delay (limits.is_exact): a group is resolved against its
-- own rule, found by name, and the glob rules alone, whatever the number of hosts.
CREATE INDEX limits_globs ON limits (pattern) WHERE pattern GLOB '*[*?[]*';
