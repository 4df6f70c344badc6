DROP TABLE jobvisor_queue_claims;
DROP TABLE jobvisor_queues;
