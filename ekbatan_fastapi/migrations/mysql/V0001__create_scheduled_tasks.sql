-- db-scheduler's scheduled_tasks table for MySQL 8+ and MariaDB 10.6+ (and MySQL 5.7 or MariaDB
-- 10.3-10.5 with the "mysql5" override: the DDL is the same), as in db-scheduler's
-- mysql_tables.sql and mariadb_tables.sql with one change: the timestamps are datetime(6)
-- holding UTC instead of timestamp(6). A timestamp is converted through the session time zone,
-- ends in 2038, and on MariaDB without explicit_defaults_for_timestamp the first "timestamp NOT
-- NULL" column silently gets ON UPDATE CURRENT_TIMESTAMP (db-scheduler issue #258).
-- db-scheduler itself works on this table with alwaysPersistTimestampInUTC() (db-scheduler
-- issue #514 proposes the same column type).
CREATE TABLE scheduled_tasks (
    task_name            VARCHAR(100) NOT NULL,
    task_instance        VARCHAR(100) NOT NULL,
    task_data            BLOB,
    execution_time       DATETIME(6)  NOT NULL,
    picked               BOOLEAN      NOT NULL,
    picked_by            VARCHAR(50),
    last_success         DATETIME(6)  NULL,
    last_failure         DATETIME(6)  NULL,
    consecutive_failures INT,
    last_heartbeat       DATETIME(6)  NULL,
    version              BIGINT       NOT NULL,
    priority             SMALLINT,
    PRIMARY KEY (task_name, task_instance),
    INDEX execution_time_idx (execution_time),
    INDEX last_heartbeat_idx (last_heartbeat),
    INDEX priority_execution_time_idx (priority DESC, execution_time ASC)
);
