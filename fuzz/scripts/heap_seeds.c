/* Writes seeds of the glibc_heap and holders_graph fuzz targets from this
 * program's own heap (glibc's malloc): a main arena with blocks in use,
 * in tcaches, fastbins and bins, and a thread arena; blocks that point at
 * each other from a global list. Image format: fuzz/src/lib.rs.
 * Build and run: gcc -O1 -pthread -o heap_seeds heap_seeds.c &&
 * ./heap_seeds GLIBC_SEED HOLDERS_SEED */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAP_MAX (64ul << 20)
#define STATE_TOP 96
#define STATE_NEXT 2160
#define STATE_BYTES 2200

struct node { struct node *next; void *data; uint64_t tag; };
struct node *head; /* the global root of the holders seed */
static void *thread_chunk;

static void put(FILE *out, const void *p, size_t n) { fwrite(p, 1, n, out); }
static void put_u8(FILE *out, uint8_t v) { put(out, &v, 1); }
static void put_u32(FILE *out, uint32_t v) { put(out, &v, 4); }
static void put_u64(FILE *out, uint64_t v) { put(out, &v, 8); }

/* One image range per 60 KiB piece. */
static void put_range(FILE *out, uint64_t start, uint64_t end) {
    while (start < end) {
        uint16_t n = end - start > 60000 ? 60000 : (uint16_t)(end - start);
        put_u64(out, start);
        put(out, &n, 2);
        put(out, (void *)start, n);
        start += n;
    }
}

static void *thread_main(void *arg) {
    (void)arg;
    void *keep[8];
    for (int i = 0; i < 8; i++) keep[i] = malloc(24 + 40 * i);
    free(keep[2]);
    free(keep[5]);
    thread_chunk = keep[0];
    return NULL;
}

static uint64_t word(uint64_t address) { return *(uint64_t *)address; }

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    pthread_t thread;
    pthread_create(&thread, NULL, thread_main, NULL);
    pthread_join(thread, NULL);
    /* The list the holders seed walks; some blocks freed (tcache,
     * fastbin, a larger one to a bin). */
    for (int i = 0; i < 12; i++) {
        struct node *n = malloc(sizeof *n);
        n->next = head;
        n->data = malloc(16 + 24 * i);
        n->tag = i;
        head = n;
    }
    void *loose[6];
    for (int i = 0; i < 6; i++) loose[i] = malloc(i < 3 ? 32 : 1200);
    for (int i = 0; i < 6; i += 2) free(loose[i]);
    void *fast[9];
    for (int i = 0; i < 9; i++) fast[i] = malloc(40);
    for (int i = 0; i < 9; i++) free(fast[i]);

    uint64_t heap_info = (uint64_t)thread_chunk & ~(HEAP_MAX - 1);
    uint64_t thread_arena = word(heap_info);
    uint64_t main_arena = word(thread_arena + STATE_NEXT);
    uint64_t brk_start = 0, brk_end = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    while (fgets(line, sizeof line, maps))
        if (strstr(line, "[heap]")) sscanf(line, "%lx-%lx", &brk_start, &brk_end);
    fclose(maps);
    uint64_t main_top = word(main_arena + STATE_TOP);
    uint64_t thread_top = word(thread_arena + STATE_TOP);

    FILE *out = fopen(argv[1], "wb");
    put_u8(out, 36);
    put_u64(out, main_arena);
    put_u64(out, 0);
    put_u64(out, brk_start);
    put_u64(out, brk_end);
    put_u8(out, 2);
    put_u64(out, (uint64_t)head);
    put_u32(out, sizeof *head);
    put_u64(out, (uint64_t)thread_chunk);
    put_u32(out, 24);
    put_range(out, main_arena, main_arena + STATE_BYTES);
    put_range(out, brk_start, main_top + 32);
    put_range(out, heap_info, thread_top + 32);
    fclose(out);

    out = fopen(argv[2], "wb");
    put_u8(out, 24);
    int count = 0;
    for (struct node *n = head; n && count < 24; n = n->next, count += 2) {
        put_u64(out, (uint64_t)n);
        put_u32(out, sizeof *n);
        put_u8(out, 0);
        put_u64(out, (uint64_t)n->data);
        put_u32(out, 16 + 24 * n->tag);
        put_u8(out, n->tag % 3 == 0 ? 4 : 0);
    }
    put_u8(out, 0x2);
    put_range(out, (uint64_t)&head, (uint64_t)&head + 8);
    put_range(out, brk_start, main_top);
    fclose(out);
    return 0;
}
