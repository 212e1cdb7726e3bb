-- Webhook deliveries at stream speed (issue 55): the foreign keys of the delivery queue are
-- checked on every row of its hottest statements (each delivery recorded, each attempt's
-- outcome) and protect nothing the code does not already: subscriptions are never deleted
-- (deleted_at marks them), and the only statement that deletes deliveries, the dispatcher's
-- retention, deletes their attempts with them (processors/webhooks dispatcher.go).
alter table webhook_deliveries drop constraint webhook_deliveries_webhook_id_fkey;
alter table webhook_attempts drop constraint webhook_attempts_delivery_id_fkey;
