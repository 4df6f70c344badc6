DROP TABLE jobvisor_nodes;
