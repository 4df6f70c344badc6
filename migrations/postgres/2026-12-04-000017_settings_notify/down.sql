DROP TRIGGER jobvisor_queues_settings_notify_trg ON jobvisor_queues;
DROP FUNCTION jobvisor_queues_settings_notify();
