/*
 * Output redirection of spawned tasks, on our libpvm3.so.3.
 *
 * Without arguments (the collector): sets PvmOutputTid to itself,
 * PvmOutputCode 77 and PvmOutputContext its context, spawns two copies
 * of itself ("child"); each child writes a line on stdout and one on
 * stderr and spawns a copy ("grandchild"), which inherits the
 * destination and writes one line. The collector receives the messages
 * (int tid, int count, then count bytes) and checks, per task: first the
 * spawn notice (count -1, then the parent's TID) and the start notice
 * (-2), then its text, then the end (count 0), all from the host's
 * daemon TID; the grandchildren's parents are the children; both
 * children's spawn notices before either child's other notices.
 *
 * With "catch FILE": pvm_catchout(FILE), spawns one copy ("catchee")
 * writing two lines, pvm_exit (which waits for its output), then checks
 * FILE holds "[t..] BEGIN", the two lines and "[t..] EOF".
 *
 * Prints "output: ok" at the end; any failure prints what and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pvm3.h>

static int failures;
#define CHECK(c, ...) do { if (!(c)) { printf("output: FAILED %s: ", #c); printf(__VA_ARGS__); printf("\n"); failures++; } } while (0)

#define CODE 77
#define MAXT 8

struct task {
	int tid, ptid, spawned, started, ended, order_ok;
	char text[512];
	int len;
};

static struct task tasks[MAXT];
static int ntasks;

static struct task *task(int tid)
{
	for (int i = 0; i < ntasks; i++)
		if (tasks[i].tid == tid)
			return &tasks[i];
	if (ntasks == MAXT)
		return 0;
	tasks[ntasks].tid = tid;
	tasks[ntasks].order_ok = 1;
	return &tasks[ntasks++];
}

/* Whether copy `tid` has been announced (its -1 notice came). */
static int announced(int tid)
{
	for (int i = 0; i < ntasks; i++)
		if (tasks[i].tid == tid)
			return tasks[i].spawned;
	return 0;
}

static int collector(const char *self)
{
	int me = pvm_mytid();
	pvm_setopt(PvmOutputTid, me);
	pvm_setopt(PvmOutputContext, pvm_getcontext());
	pvm_setopt(PvmOutputCode, CODE);
	CHECK(pvm_getopt(PvmOutputTid) == me, "PvmOutputTid %d", pvm_getopt(PvmOutputTid));
	char *args[] = {"child", 0};
	int kids[2];
	int n = pvm_spawn((char *)self, args, PvmTaskDefault, "", 2, kids);
	CHECK(n == 2, "spawned %d", n);
	int daemon = (int)0x80000000 | (me & 0x3ffc0000);
	int ended = 0;
	struct timeval tmout = {30, 0};
	while (ended < 4) {
		int b = pvm_trecv(-1, CODE, &tmout);
		if (b <= 0) {
			CHECK(b > 0, "no output message in 30 s (%d of 4 ended)", ended);
			break;
		}
		int bytes, tag, src, tid, count;
		pvm_bufinfo(b, &bytes, &tag, &src);
		CHECK(src == daemon, "from t%x, not t%x", src, daemon);
		pvm_upkint(&tid, 1, 1);
		pvm_upkint(&count, 1, 1);
		/* Both copies of the spawn are announced before either says
		 * more: PVM's console frees a job once every copy it was told
		 * of has ended. */
		if (count != -1 && (tid == kids[0] || tid == kids[1]))
			CHECK(announced(kids[0]) && announced(kids[1]), "t%x's notice %d came before both copies were announced", tid, count);
		struct task *t = task(tid);
		if (!t) {
			CHECK(t, "more than %d tasks", MAXT);
			break;
		}
		if (count == -1) {
			pvm_upkint(&t->ptid, 1, 1);
			t->order_ok &= !t->started && !t->len && !t->ended;
			t->spawned = 1;
		} else if (count == -2) {
			int ptid;
			pvm_upkint(&ptid, 1, 1);
			t->order_ok &= t->spawned && !t->len && !t->ended && ptid == t->ptid;
			t->started = 1;
		} else if (count == 0) {
			t->order_ok &= t->started;
			t->ended = 1;
			ended++;
		} else {
			t->order_ok &= t->started && !t->ended;
			if (t->len + count < (int)sizeof(t->text)) {
				pvm_upkbyte(t->text + t->len, count, 1);
				t->len += count;
			}
		}
	}
	CHECK(ntasks == 4, "%d tasks sent output", ntasks);
	int children = 0, grandchildren = 0;
	for (int i = 0; i < ntasks; i++) {
		struct task *t = &tasks[i];
		t->text[t->len] = 0;
		CHECK(t->order_ok && t->ended, "t%x: notices out of order or no end", t->tid);
		if (t->ptid == me) {
			children++;
			char want1[64], want2[64];
			snprintf(want1, sizeof want1, "child t%x out\n", t->tid);
			snprintf(want2, sizeof want2, "child t%x err\n", t->tid);
			CHECK(strstr(t->text, want1) && strstr(t->text, want2), "t%x wrote {%s}", t->tid, t->text);
		} else {
			grandchildren++;
			CHECK(t->ptid == kids[0] || t->ptid == kids[1], "t%x: parent t%x", t->tid, t->ptid);
			char want[64];
			snprintf(want, sizeof want, "grandchild t%x of t%x\n", t->tid, t->ptid);
			CHECK(!strcmp(t->text, want), "t%x wrote {%s}", t->tid, t->text);
		}
	}
	CHECK(children == 2 && grandchildren == 2, "%d children, %d grandchildren", children, grandchildren);
	pvm_exit();
	return 0;
}

static int catcher(const char *self, const char *file)
{
	FILE *f = fopen(file, "w");
	if (!f) {
		perror(file);
		return 1;
	}
	pvm_mytid();
	CHECK(pvm_catchout(f) == 0, "pvm_catchout");
	char *args[] = {"catchee", 0};
	int tid;
	CHECK(pvm_spawn((char *)self, args, PvmTaskDefault, "", 1, &tid) == 1, "spawn");
	pvm_exit();
	fclose(f);
	char want[256], got[1024] = "";
	snprintf(want, sizeof want, "[t%x] BEGIN\n[t%x] caught one\n[t%x] caught two\n[t%x] EOF\n", tid, tid, tid, tid);
	f = fopen(file, "r");
	size_t n = f ? fread(got, 1, sizeof got - 1, f) : 0;
	got[n] = 0;
	if (f)
		fclose(f);
	CHECK(!strcmp(got, want), "the file holds {%s}", got);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "child")) {
		int me = pvm_mytid();
		printf("child t%x out\n", me);
		fflush(stdout);
		fprintf(stderr, "child t%x err\n", me);
		char *args[] = {"grandchild", 0};
		int tid;
		pvm_spawn(argv[0], args, PvmTaskDefault, "", 1, &tid);
		pvm_exit();
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "grandchild")) {
		printf("grandchild t%x of t%x\n", pvm_mytid(), pvm_parent());
		pvm_exit();
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "catchee")) {
		pvm_mytid();
		printf("caught one\ncaught two");
		pvm_exit();
		return 0;
	}
	if (argc > 2 && !strcmp(argv[1], "catch"))
		catcher(argv[0], argv[2]);
	else
		collector(argv[0]);
	if (failures) {
		printf("output: %d failures\n", failures);
		return 1;
	}
	printf("output: ok\n");
	return 0;
}
