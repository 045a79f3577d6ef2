/*
 * The pod sandbox ("pause") process: holds the pod's namespaces, reaps zombies, exits 0 on
 * SIGINT/SIGTERM. Same behaviour as Kubernetes' build/pause/linux/pause.c, written for this
 * project because registry.k8s.io is not reachable from the machines it is built on.
 * Build: gcc -Os -static -o pause pause.c
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef VERSION
#define VERSION "3.10"
#endif

static void sigdown(int signo) {
  psignal(signo, "Shutting down, got signal");
  exit(0);
}

static void sigreap(int signo) {
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "-v")) {
      printf("pause.c %s\n", VERSION);
      return 0;
    }
  }

  if (getpid() != 1) {
    /* Not an error: it may be run by hand or in a shared PID namespace. */
    fprintf(stderr, "Warning: pause should be the first process\n");
  }

  struct sigaction down = {.sa_handler = sigdown};
  if (sigaction(SIGINT, &down, NULL) < 0) {
    return 1;
  }
  if (sigaction(SIGTERM, &down, NULL) < 0) {
    return 2;
  }
  struct sigaction reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGCHLD, &reap, NULL) < 0) {
    return 3;
  }

  for (;;) {
    pause();
  }
  fprintf(stderr, "Error: infinite loop terminated\n");
  return 42;
}
