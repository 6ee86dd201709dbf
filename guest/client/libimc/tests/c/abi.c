/* Drives libimc through its C ABI against the fake imcd of tests/c_abi.rs.
 * Prints one line per check; exits nonzero on the first failure. */
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/imc.h>

#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); \
    printf(__VA_ARGS__); printf(" (%s)\n", imc_errmsg()); return 1; } } while (0)

int main(void)
{
    imc_asid_t id = -1;
    imc_host_t hosts[4];
    int st, n;

    st = imc_asalloc(123, 8192, IMC_URW, IMC_COHERENT, &id);
    CHECK(st == IMC_SUCCESS && id == 5, "asalloc: status %d id %d", st, id);
    printf("asalloc ok id %d\n", id);

    st = imc_asalloc(124, 8192, IMC_URW, IMC_EXCL, &id);
    CHECK(st == IMC_EXISTS, "exclusive asalloc: status %d", st);
    CHECK(strstr(imc_errmsg(), "exists") != NULL, "errmsg '%s'", imc_errmsg());
    printf("exists ok: %s\n", imc_errmsg());

    st = imc_asalloc(125, 8192, IMC_URW, 0x80, &id);
    CHECK(st == IMC_INVALID, "bad flag: status %d", st);
    st = imc_asalloc(125, 8192, IMC_URW, 0, NULL);
    CHECK(st == IMC_INVALID, "NULL id: status %d", st);
    st = imc_asattach(5, 3, IMC_SHARED, 0, NULL);
    CHECK(st == IMC_INVALID, "bad attach: status %d", st);
    printf("invalid ok\n");

    n = imc_gethosts(hosts, 4);
    CHECK(n == 2 && hosts[0].node == 0 && strcmp(hosts[1].name, "node1") == 0, "gethosts %d", n);
    printf("gethosts ok %d %s %s\n", n, hosts[0].name, hosts[1].name);

    st = imc_kill("node9", 1, SIGUSR1);
    CHECK(st == IMC_NOHOST, "kill: status %d", st);
    st = imc_lkacquire(77, 0, 0, IMC_LOCKWAIT);
    CHECK(st == IMC_NOTALLOC, "lkacquire on no set: status %d", st);
    st = imc_asdealloc(5);
    CHECK(st == IMC_SUCCESS, "asdealloc: status %d", st);
    st = imc_asdealloc(6);
    CHECK(st == IMC_NOTALLOC, "second asdealloc: status %d", st);
    printf("all checks passed\n");
    return 0;
}
