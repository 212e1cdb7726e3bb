-- Webhook deliveries at stream speed (issue 55): a delivery the consumer sent before recording it
-- (processors/webhooks fast.go) is written once with its first attempt in its own row, rather
-- than with a second row in webhook_attempts and that table's two indexes. Measured on one
-- subscription, that row was about 7 % of the pipeline's deliveries a second.
--
-- The first attempt's id is the delivery's ULID: att_ + the id after dlv_. Later attempts (a
-- lane's retries and redeliveries) are rows of webhook_attempts, as every attempt of a delivery
-- inserted pending is. webhook_attempt_log is both, the one place the attempt log is read from.
alter table webhook_deliveries
    add column first_attempted_at   timestamptz,  -- set when the first attempt is in this row
    add column first_status_code    integer,
    add column first_latency_ms     integer,
    add column first_error          text,
    add column first_response_body  text;

create view webhook_attempt_log as
select id, delivery_id, webhook_id, org_id, status_code, latency_ms, error, response_body, attempted_at
from webhook_attempts
union all
select 'att_' || substr(id, 5), id, webhook_id, org_id, first_status_code, first_latency_ms, first_error,
    first_response_body, first_attempted_at
from webhook_deliveries
where first_attempted_at is not null;
