// launcher runs ClickHouse as a loopback server out of chDB's libchdb.so, which embeds
// clickhouse-local. It is compiled by clickhouse.sh fetch (cc launcher.c -ldl); run
//
//     carehub-clickhouse LIBCHDB [clickhouse-local options...]
//
// e.g. --path=DIR --listen_host=127.0.0.1 --tcp_port=19000 --http_port=18123, then after a "--"
// server configuration such as --logger.size=50M. It loads LIBCHDB and calls query_stable_v2
// (chDB's stable C entry: clickhouse-local's argc/argv, one result) with those options, a query
// that starts the TCP and HTTP listeners, and --interactive.
//
// Why interactive, on a pseudo-terminal: a non-interactive clickhouse-local (26.7) installs
// Poco's KillingErrorHandler, so the first exception a connection handler lets out, such as a
// client resetting a native-protocol connection (a test that kills a node), aborts the whole
// server (ClickHouse issue 115666, fixed after 26.7 by PR 115715). An interactive one keeps
// serving, as clickhouse-server does. Interactive needs stdin to be a terminal: a pty whose
// master only this process holds. After the query, clickhouse-local waits at its prompt for a
// line that never comes; SIGTERM, SIGINT or SIGHUP closes the master, the prompt reads end of
// file, and clickhouse-local shuts down as after any session, closing listeners and tables.
// Exit status 0 after a clean stop, 1 on an error.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// struct local_result_v2 and the two entries, as chDB's programs/local/chdb.h declares them.
struct local_result_v2 {
	char *buf;
	size_t len;
	void *_vec;
	double elapsed;
	uint64_t rows_read;
	uint64_t bytes_read;
	char *error_message;
};
typedef struct local_result_v2 *(*query_stable_v2_fn)(int argc, char **argv);
typedef void (*free_result_v2_fn)(struct local_result_v2 *result);

static char interactive[] = "--interactive";
static char serve_query[] = "--query=SYSTEM START LISTEN TCP; SYSTEM START LISTEN HTTP";

static volatile sig_atomic_t stop_fd = -1;

static void on_stop(int sig) {
	(void)sig;
	int fd = stop_fd;
	if (fd >= 0) {
		stop_fd = -1;
		static const char msg[] = "carehub-clickhouse: stopping\n";
		ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
		(void)n;
		close(fd);
	}
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: %s LIBCHDB [clickhouse-local options...]\n", argv[0]);
		return 2;
	}
	// O_NOCTTY: the pty must not become this session leader's controlling terminal.
	int master = posix_openpt(O_RDWR | O_NOCTTY);
	if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
		perror("carehub-clickhouse: pty");
		return 1;
	}
	const char *name = ptsname(master);
	int term = name == NULL ? -1 : open(name, O_RDWR | O_NOCTTY);
	if (term < 0 || dup2(term, STDIN_FILENO) < 0) {
		perror("carehub-clickhouse: pty");
		return 1;
	}
	close(term);
	// Close-on-exec: a process ClickHouse starts must not keep the terminal open past a stop.
	fcntl(master, F_SETFD, FD_CLOEXEC);
	stop_fd = master;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);

	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
	if (lib == NULL) {
		fprintf(stderr, "carehub-clickhouse: %s\n", dlerror());
		return 1;
	}
	query_stable_v2_fn query = (query_stable_v2_fn)dlsym(lib, "query_stable_v2");
	free_result_v2_fn free_result = (free_result_v2_fn)dlsym(lib, "free_result_v2");
	if (query == NULL || free_result == NULL) {
		fprintf(stderr, "carehub-clickhouse: %s has no query_stable_v2/free_result_v2\n", argv[1]);
		return 1;
	}

	// clickhouse-local's argv: a program name, ours, the caller's options. Ours come first:
	// options after a "--" are server configuration (--logger.size=…).
	int n = argc - 2;
	char **args = calloc((size_t)n + 4, sizeof *args);
	if (args == NULL) {
		perror("carehub-clickhouse");
		return 1;
	}
	args[0] = argv[0];
	args[1] = interactive;
	args[2] = serve_query;
	memcpy(args + 3, argv + 2, (size_t)n * sizeof *args);
	fprintf(stderr, "carehub-clickhouse: serving (pid %d)\n", (int)getpid());
	struct local_result_v2 *res = query(n + 3, args);
	if (res == NULL) {
		fprintf(stderr, "carehub-clickhouse: query_stable_v2 returned no result\n");
		return 1;
	}
	int status = 0;
	if (res->error_message != NULL) {
		fprintf(stderr, "carehub-clickhouse: %s\n", res->error_message);
		status = 1;
	} else {
		fprintf(stderr, "carehub-clickhouse: stopped\n");
	}
	free_result(res);
	free(args);
	return status;
}
