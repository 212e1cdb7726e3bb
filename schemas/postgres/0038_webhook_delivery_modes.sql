-- How a subscription's deliveries are sent (issue 55; processors/webhooks deliver.go):
-- concurrent by default, max_in_flight attempts at once, order best effort; or ordered, one
-- POST at a time in seq order carrying up to batch_size events as a JSON array. rate_limit caps
-- deliveries a second (0: none). Existing subscriptions, strictly ordered one at a time before,
-- become concurrent: what receivers get by default, as in the reference webhook services.
alter table webhooks
    add column ordered       boolean not null default false,
    add column max_in_flight integer not null default 16 check (max_in_flight between 1 and 64),
    add column batch_size    integer not null default 1 check (batch_size between 1 and 100),
    add column rate_limit    integer not null default 0 check (rate_limit between 0 and 10000);
