
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void)
{
    int levels[4];
    nvtxEventAttributes_t a = {0};
    nvtxDomainHandle_t d;
    nvtxRangeId_t id;

    levels[0] = nvtxRangePushA("a\tb\\c\nd");
    levels[1] = nvtxRangePushW(L"caf\u00e9 \U0001F600");
    nvtxMarkA("tick");
    levels[2] = nvtxRangePop();
    levels[3] = nvtxRangePop();
    id = nvtxRangeStartA("async");
    nvtxRangeEnd(id);
    nvtxNameOsThreadA((uint32_t)syscall(SYS_gettid), "main");
    nvtxNameCategoryA(7, "seven");

    d = nvtxDomainCreateW(L"wide");
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.category = 7;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = 0xff00ff00;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = nvtxDomainRegisterStringW(d, L"registered");
    nvtxDomainRangePushEx(d, &a);
    a.colorType = NVTX_COLOR_UNKNOWN;
    a.messageType = NVTX_MESSAGE_TYPE_UNICODE;
    a.message.unicode = L"w\u00fcnsch";
    nvtxDomainMarkEx(d, &a);
    nvtxDomainRangePop(d);

    printf("%d %d %d %d %llu %ld\n", levels[0], levels[1], levels[2], levels[3],
           (unsigned long long)id, (long)syscall(SYS_gettid));
    return 0;
}
