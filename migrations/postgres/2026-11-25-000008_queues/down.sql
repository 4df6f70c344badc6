DROP TRIGGER jobvisor_queues_notify_trg ON jobvisor_queues;
DROP FUNCTION jobvisor_queues_notify();
DROP TABLE jobvisor_queue_claims;
DROP TABLE jobvisor_queues;
